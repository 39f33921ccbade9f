"""Example jobs built on the runtime; :mod:`.fraud` is the main job the demo runs."""
