"""Store locations on object storage: `workbench.store.objects`, importable here too."""

from .store.objects import SCHEME, ObjectStore, is_url, location

__all__ = ["SCHEME", "ObjectStore", "is_url", "location"]
