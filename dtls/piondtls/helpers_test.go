package piondtls

import "log/slog"

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }
