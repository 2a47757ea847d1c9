"""Running the core: one driver loop with a virtual and a wall clock, and its backends."""
