"""The built-in runner: ``backchannel run`` hosts a team file's ``llm`` members on a hub.

* :mod:`.teamfile` — the team file (YAML) and its checks;
* :mod:`.command` — the ``run`` command: set the team up, host it, show progress, report;
* :mod:`.host` — the :class:`~.host.Runner` and one turn loop per hosted session;
* :mod:`.models` — the model protocol and its values; :mod:`.providers` the Anthropic and
  OpenAI models, :mod:`.scripted` the offline scripted model;
* :mod:`.tools` — the tools a hosted model gets; :mod:`.story` — the progress lines.

Hook receivers for agents run by their own CLIs (Claude Code, Codex, Gemini) are in
:mod:`backchannel.runtimes`. Nothing is imported here, so loading one module (the
scripted model, say) does not load the rest.
"""
