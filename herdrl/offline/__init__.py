"""Learning from recorded experience: datasets of episodes (Minari's format), recording, and their reading."""

from herdrl.offline.dataset import DatasetError, DatasetWriter, Episode, OfflineDataset, open_dataset, write_metadata

__all__ = ["DatasetError", "DatasetWriter", "Episode", "OfflineDataset", "open_dataset", "write_metadata"]
