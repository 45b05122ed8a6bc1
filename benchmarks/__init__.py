"""flowrl's benchmarks: scripts run as ``python benchmarks/NAME.py``, and the suite ``python -m benchmarks all``.

The package only makes the suite runnable with ``-m``; each script stays a stand-alone file that imports flowrl
(never the other way round), and ``peers/`` holds scripts for another virtualenv (``peers/setup.sh``).
"""
