"""The pure core: no Ray, no torch, no clock. The coordinator's state and transitions
(`coordination`), its commands and decisions (`commands`), the dynamic lease book
(`leases`) and which plan an epoch gets (`planning`). tests/test_core_coordination.py
checks that importing it loads neither Ray nor torch."""
