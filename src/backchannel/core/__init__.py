"""Pure rules: functions over plain values that return decisions. No I/O, no clock."""
