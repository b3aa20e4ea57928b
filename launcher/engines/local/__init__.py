"""The local engine: a run's tasks as processes on this machine (``backend.py``), in a network
namespace of the run's own unless the run asks for the host's network (``netns.py``; the
namespace's holder, a stdlib script run as a process of its own, is ``node/netns_holder.py``)."""
