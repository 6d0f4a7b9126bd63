"""Who may connect and what they may do: password files, tokens, the twisted.cred portal, the ACL file."""
