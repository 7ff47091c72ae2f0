"""Frozen pydantic models: GPU shapes, bundles, pod shapes, views, findings, plans.

Pure data: nothing here imports ray, kubernetes or pynvml, or does I/O.
"""
