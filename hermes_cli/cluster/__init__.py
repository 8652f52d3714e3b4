"""Scale-out over many engines (issue 25): the pure parts the Ray registry uses.

``placement`` is the stream → engine table (placement, epochs, moves, drain, failover, rebuild);
``simulate`` runs it against a cost model of ingest and answers. Neither imports torch or Ray.
"""
