"""The doctor: observe Ray, Kubernetes and NVML (snapshot), reconcile (raygpu.plan.doctor), render, repair."""
