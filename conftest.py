"""Root pytest hooks: the pre-flight report (tools/preflight.py) after every run of the suite."""
from tools.preflight import Recorder, report_lines

_recorder = Recorder()


def pytest_runtest_logreport(report):
    _recorder.add(report)


def pytest_terminal_summary(terminalreporter):
    if _recorder.seconds:  # something ran (not --collect-only)
        for line in report_lines(_recorder):
            terminalreporter.write_line(line)
