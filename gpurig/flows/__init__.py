"""A task's whole run without Invoke: the fleet run a person watches, and the work several tasks share.

Above every other library layer and below ``gpurig.cli``: a module here may
use the whole library, presentation (gpurig.report) included, and takes the
validated flags (``HostOptions``) and loaded inputs (an image spec, a
project root, a command) a task module hands it, never Invoke's context.
So a deploy, a verify, a job run or the CI chain that strings them together
can be driven from Python as the tasks drive it.
"""
