"""The node's lease service: the ledger, admitting, transitions, the journal, availability,
request ids, refusals, events."""
