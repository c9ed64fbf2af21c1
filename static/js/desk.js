// Keyboard shortcuts for the desk; see templates/approvals/.
