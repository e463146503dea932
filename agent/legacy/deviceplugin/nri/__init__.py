"""The agent as an NRI plugin: it puts each pod's lease into its containers at CreateContainer."""
