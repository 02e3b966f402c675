"""rqrl control plane: commanders, the coordinator daemon, the ``rqrl`` CLI and status."""
