"""The pure scheduling core: task graph, scheduler state, policies, checker, jobs, context.

Plain data and functions: no threads, clocks, files or ONNX. Imports only the
standard library, masa.common and its own modules.
"""
