"""Code mode of a conversation (issue 43; docs/behaviour.md (chat, code mode)).

- :mod:`.rules` — pure rules: the state kept, the criteria, the texts the model is given;
- :mod:`.workspace` — the workspace service's client (``loki.workspace.*``);
- :mod:`.check` — the criteria checker (commands in the sandbox, the verifier's judgement);
- :mod:`.loop` — the verification loop's place in a turn (corrective rounds);
- :mod:`.api` — ``loki.chat.code`` (get, mode, criteria, check).

The tools themselves are :mod:`loki_chat.tools.code`.
"""
