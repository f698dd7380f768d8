"""Remote access through an untrusted relay (issue 45): paired devices and the end-to-end
sealed chat routes. See docs/security.md for the threat model.

- :mod:`.devices`: the devices in Redis (keys sealed at rest, revocation, request counters);
- :mod:`.sealed`: opening a device's sealed request, sealing the answer;
- :mod:`.stream`: the sealed SSE stream;
- :mod:`.pairing`: ``/api/e2e/devices`` (behind the API key);
- :mod:`.routes`: the sealed chat routes (``router``, the pairing routes included) and the
  PWA's path (``static/e2e/``).

The envelope itself is :mod:`loki_shared.e2e_envelope` (the Python client uses it too).
"""
