"""gpurig: PyTorch+CUDA images, GPU hosts, deployments, verification and monitoring."""

__version__ = "0.1.0"
