"""Reports of runs: summary JSON, tables and Chrome traces."""
