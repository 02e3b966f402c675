"""rqrl data plane: collector and learner tasks, run by the stock ``rq worker``."""
