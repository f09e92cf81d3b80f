"""Plan search. For now: a simple default plan so `rpeg predict` can cost a job with no layout."""
