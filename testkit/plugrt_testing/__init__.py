"""The authoring kit (distribution plugrt-testing): the pytest plugin with its fixtures and the conformance suite
for backend packages, the differential fuzzer, the fake GPU memory and test streams."""
