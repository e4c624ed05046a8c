"""Slurm tests: a controller and two GPU nodes (systemd container hosts, stand-in GPUs) that gpurig provisions and runs jobs on."""
