pytest_plugins = ["raygpu.testing.pytest_plugin"]
