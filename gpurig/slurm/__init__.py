"""Everything gpurig says to Slurm, in one room.

The cluster as data and its files (conf), the provisioning steps of a host
(hoststeps) and of the whole cluster (cluster), job submission through sbatch
(sbatch) and slurmrestd (rest), and a node's health as its controller sees it
(health).
"""
