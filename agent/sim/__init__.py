"""The simulated node: fakes of every hardware port, wired to look like a GPU node."""
