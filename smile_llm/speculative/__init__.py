"""Speculative decoding: the acceptance rules, token trees, draft chains, the draft policy that
sizes each round, and the drafters behind one protocol (``drafters/``)."""
