"""Ray clusters: connecting to one (embedded or by address); launchers come later."""

from herdrl.cluster.connect import ClusterError, connect, disconnect

__all__ = ["ClusterError", "connect", "disconnect"]
