"""The SSH backend: tasks on remote hosts, each run by the tfl agent over its own SSH session.

``connect`` (fabric, host keys) · ``wire`` (the agent's requests) · ``node/`` (the agent that runs on the
host, stdlib only) · ``backend`` (``SSHBackend``) · ``recorded`` (status and stop of a recorded run).
Importing this package imports neither fabric nor paramiko.
"""
