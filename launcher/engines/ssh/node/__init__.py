"""The SSH engine's node side: the agent (``agent``, ``agent_files``), sent to each host as source on every
session, never installed. Standard library only (Python >= 3.8): it imports nothing of tfl."""
