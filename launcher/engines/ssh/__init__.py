"""The SSH backend: tasks on remote hosts, all of a host's tasks run by one tfl agent over one SSH session.

``connect`` (fabric, host keys) · ``wire`` (the agent's requests) · ``node/`` (the agent that runs on the
host, stdlib only) · ``backend`` (``SSHBackend``) · ``recorded`` (status and stop of a recorded run).
Importing this package imports neither fabric nor paramiko.
"""
