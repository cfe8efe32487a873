#!/usr/bin/perl
# placeholder: being written
exit 2;
