"""Deploy tests against a provisioned systemd host with stand-in GPUs."""
