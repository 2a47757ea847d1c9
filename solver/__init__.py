"""CP-SAT model of the Masa scheduling problem and the `masa-optimal` command."""
