"""Deploy: run the built images on inventory hosts with the right GPUs, ports, volumes, keys and limits."""
