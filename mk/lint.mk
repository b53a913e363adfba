# Formatting and lint (issue 23, point 6), part of `make test`:
#   make check-format  clang-format (Debian's, .clang-format) over every C++, CUDA and proto
#                      file git tracks; fails, naming each file and line, on anything it would
#                      change (`make format` applies it; .git-blame-ignore-revs skips the
#                      whole-tree commit in `git blame`)
#   make lint          check-format, then ruff (ruff.toml; pinned in tests/requirements/pins.txt,
#                      from PyPI into $(LINT_VENV), mk/cache.mk) over tools/ and tests/
FORMAT_FILES = git ls-files '*.cc' '*.h' '*.cu' '*.cuh' '*.proto'

.PHONY: check-format format lint

check-format:
	@$(FORMAT_FILES) | xargs clang-format --dry-run --Werror
	@echo "check-format: $$($(FORMAT_FILES) | wc -l) files as clang-format $$(clang-format --version | grep -o '[0-9][0-9.]*' | head -1) writes them"

format:
	$(FORMAT_FILES) | xargs clang-format -i

lint: check-format $(LINT_VENV)/.complete
	$(LINT_VENV)/bin/ruff check --no-cache tools tests
