"""The built-in analyses, one module each, registered the way a user's plugin registers
(`analyses.registry.register_analysis`). Every module in this folder is imported when the
registry is first read; each module's `order` places its table and report section."""
