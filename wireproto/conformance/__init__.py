"""Conformance kits: wireproto's codecs turned outward to judge another implementation.

`wireproto conform server URL --protocol P` runs a catalogue of cases (wireproto.conformance.
<protocol>) against someone's server and reports each case's outcome with the bytes exchanged,
as docs/conformance.md describes. The case model is in `model`, the recorded connections in
`probe`, the running of cases in `runner`, the reports in `report` and the command in `command`.
"""
