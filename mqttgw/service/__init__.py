"""The running gateway: settings, the objects built from them, the twistd plugin's service, reload and logs."""
