"""The authoring kit: fixtures and the conformance suite for backend packages."""
