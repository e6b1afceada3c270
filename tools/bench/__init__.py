"""Device benchmark family: attention kernels and device bandwidth/TFLOPS; MCP registration in adapter.py."""
