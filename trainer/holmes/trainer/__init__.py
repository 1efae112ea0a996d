"""The bundled training engine: pipeline x data parallelism with an overlapped distributed optimizer."""
