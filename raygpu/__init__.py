"""raygpu: make Ray and Kubernetes agree about GPUs."""
