"""What the local engine runs as processes of their own, outside the launcher: stdlib only."""
