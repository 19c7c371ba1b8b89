"""The vocabulary every layer above shares: methods (the registry), cases (and their rules),
patterns and suites. It imports nothing of the engine, the method families or the front ends."""
