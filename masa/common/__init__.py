"""Utilities every layer may use: errors, units, atomic writes, progress, process memory."""
