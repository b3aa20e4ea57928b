"""The SSH backend: tasks on remote hosts, each run by the tfl agent over its own SSH session.

``connect`` (fabric, host keys) · ``wire`` (the agent's requests) · ``agent`` (runs on the
host) · ``backend`` (``SSHBackend``) · ``recorded`` (status and stop of a recorded run).
Importing this package imports neither fabric nor paramiko.
"""
