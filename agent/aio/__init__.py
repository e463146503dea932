"""The asyncio toolkit: supervised tasks, critical sections a cancelled caller cannot cut, work
owed until done."""
