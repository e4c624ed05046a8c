"""Reaching hosts: the Connection interface, local and SSH, host keys, targets, the fleet, and the one Docker Engine client."""
