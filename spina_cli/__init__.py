"""The `spina` command: one entry point over the switch, controller, agent, demo and tools."""
