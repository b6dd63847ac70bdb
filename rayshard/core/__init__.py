"""The pure core: no Ray, no torch, no clock. The coordinator's state and transitions
(`coordination`), its commands and decisions (`commands`), the dynamic lease book
(`leases`) and which plan an epoch gets (`planning`). Enforced by tests/test_core_purity.py."""
