"""Reaching hosts: the Connection interface, local and SSH, host keys, targets, the fleet, and the one Docker Engine client."""

# The loggers of the SSH library under this package (the only place that imports it): every failed handshake is
# ~65 traceback lines there, which would bury the one reason line per host (gpurig.report.configure_logging).
LIBRARY_LOGGERS = ("paramiko",)
