"""Pure vocabulary of the agent: types, errors and units. No I/O, no third-party imports."""
