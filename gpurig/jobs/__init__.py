"""Jobs: a script put on the GPUs it asks for, on a host, detached, with its state kept on the host.

``invoke run`` syncs a working directory to the host (only what changed),
hands the host's job agent (checks/job_agent.py) a job, and returns its id;
the agent waits for the job's GPUs in the host's FIFO queue, runs it in a
fresh container of the project's image (or in a deployed one), keeps its
log, exit code and GPU samples in the job's folder, and retries or stops it
as asked. ``jobs``, ``logs --job``, ``attach``, ``cancel`` and ``fetch`` read
and act on that state from any machine with the inventory.
"""
