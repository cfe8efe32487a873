#!/usr/bin/perl
# heapsight lab perl: Perl scalars, arrays and hashes, measured inside a block and after it.
#
#   perl hs-lab-perl.pl --case N [--scale F]      one test case (1..12) in this process
#   perl hs-lab-perl.pl --probe LEN [--count C] [--rounds R]
#                                    C strings of LEN characters in an array, R times over
#
# Prints one JSON object on stdout: VmRSS and VmSize (bytes) before the case, inside it
# (end of the block, every structure alive) and after it (block left, all of it freed).
# Each case's code is kept as text and compiled by a string eval when it runs, so that a
# constant such as "." x 100_000_000 is folded inside the case and not at start-up, and
# its lexicals belong to the eval and are freed when it returns (case 12 shows why: a
# plain block keeps a lexical scalar's string buffer for its next entry).
# --scale shrinks the loop counts, never the sizes of the strings or chunks.
# Core modules only. Exit 0 on success, 2 on bad arguments.

use strict;
use warnings;
use Getopt::Long qw(GetOptionsFromArray);
use Storable qw(freeze);
use B ();

# The buffer /proc/self/status is read into: allocated once, reused by every read.
my $STATUS = "\0" x 8192;

sub mem {
    my %m = (rss => 0, vm => 0);
    open(my $fh, '<', '/proc/self/status') or return \%m;
    my $n = sysread($fh, $STATUS, 8000);
    close($fh);
    return \%m unless $n;
    $m{rss} = $1 * 1024 if $STATUS =~ /^VmRSS:\s+(\d+)/m;
    $m{vm}  = $1 * 1024 if $STATUS =~ /^VmSize:\s+(\d+)/m;
    return \%m;
}

# Which allocator answers malloc here: the preloaded library shows in our own mappings.
sub allocator {
    open(my $fh, '<', '/proc/self/maps') or return 'unknown';
    my $maps = do { local $/; <$fh> };
    close($fh);
    return 'jemalloc' if $maps =~ m{/libjemalloc[^/\n]*\.so};
    return 'tcmalloc' if $maps =~ m{/libtcmalloc[^/\n]*\.so};
    return 'mimalloc' if $maps =~ m{/libmimalloc[^/\n]*\.so};
    return 'mmap'     if $maps =~ m{/libheapsight_mmap[^/\n]*\.so};
    return 'glibc';
}

sub json_str {
    my ($s) = @_;
    $s =~ s/(["\\])/\\$1/g;
    $s =~ s/\n/\\n/g;
    $s =~ s/([\x00-\x1f])/sprintf('\\u%04x', ord($1))/ge;
    return qq{"$s"};
}

sub json {
    my ($v) = @_;
    if (ref $v eq 'HASH') {
        return '{' . join(',', map { json_str($_) . ':' . json($v->{$_}) } sort keys %$v) . '}';
    }
    if (ref $v eq 'ARRAY') {
        return '[' . join(',', map { json($_) } @$v) . ']';
    }
    return 'null' unless defined $v;
    return $v if $v =~ /^-?(?:0|[1-9]\d*)(?:\.\d+)?$/;
    return json_str($v);
}

# The write-up's cases, as code. {N} and {M} are replaced by the (scaled) loop counts
# before the code is compiled, so the text reported is exactly the code that ran.
# Its "x".100 is kept as written: a concatenation giving the 4-character value "x100".
my @CASES = (
    undef,
    { title => 'do nothing', code => '', n => 0 },
    { title => '100 M-char scalar grown by 100-char chunks',
      code  => '$t .= "a"x100 for 1..{N};', n => 1_000_000 },
    { title => '100 M-char scalar built with x',
      code  => '$t .= "." x {N};', n => 100_000_000 },
    { title => 'array of 1000 scalars of 128 KiB - 14 chars',
      code  => 'push(@ta, "." x (128*1024-14)) for (1..{N});', n => 1_000 },
    { title => 'array of 1000 scalars of 128 KiB - 13 chars',
      code  => 'push(@ta, "." x (128*1024-13)) for (1..{N});', n => 1_000 },
    { title => 'hash of 1 M keys',
      code  => '$th{"k".$key_id++} = "x".100 for (1..{N});', n => 1_000_000 },
    { title => 'two hashes of 1 M keys each',
      code  => 'for (1..{N}) { $th{"k".$key_id++} = "x".100; $th2{"k".$key_id++} = "x".100 }',
      n     => 1_000_000 },
    { title => 'two hashes with the same 1 M keys',
      code  => 'for (1..{N}) { $th{"k".$key_id} = "x".100; $th2{"k".$key_id++} = "x".100 }',
      n     => 1_000_000 },
    { title => 'two hashes filled in a 1000 x 1000 loop',
      code  => 'for (1..{N}) { for (1..1_000) { $th{"k".$key_id++} = "x".100; '
             . '$th2{"k".$key_id++} = "x".100 } }',
      n     => 1_000 },
    { title => 'array of frozen 1000-key chunks of two hashes (4-char values)',
      code  => 'for (1..{N}) { for (1..1_000) { $th{"k".$key_id++} = "x".100; '
             . '$th2{"k".$key_id++} = "x".100 }; push(@ta, freeze(\%th), freeze(\%th2)); '
             . '(%th, %th2) = (); }',
      n     => 1_000 },
    { title => 'array of frozen 2000-key chunks of two hashes (100 random chars)',
      code  => 'for (1..{N}) { for (1..2_000) { $key_id++; '
             . '$th{"k".$key_id} .= chr(rand(256)) for 1..100; '
             . '$th2{"k".$key_id} .= chr(rand(256)) for 1..100 }; '
             . 'push(@ta, freeze(\%th), freeze(\%th2)); (%th, %th2) = (); }',
      n     => 500 },
    { title => 'case 2 in a plain block (no eval): the lexical keeps its buffer',
      code  => '{ my $t; $t .= "a"x100 for 1..$n; ... }', n => 1_000_000, plain => 1 },
);

sub usage {
    my ($msg) = @_;
    print STDERR "hs-lab-perl.pl: $msg\n" if $msg;
    print STDERR "usage: perl hs-lab-perl.pl --case N [--scale F]\n"
               . "       perl hs-lab-perl.pl --probe LEN [--count C] [--rounds R]\n";
    exit 2;
}

sub facts_of {
    my ($t, $ta, $th, $th2) = @_;
    my %f;
    $f{length} = length($$t) if defined $$t;
    $f{elements} = scalar(@$ta) if @$ta;
    $f{last_length} = length($ta->[-1]) if @$ta;
    $f{keys} = scalar(keys %$th) if %$th;
    $f{keys2} = scalar(keys %$th2) if %$th2;
    return \%f;
}

# Case 12, compiled with the script: a lexical in an ordinary block.
sub plain_block {
    my ($n, $inside, $facts) = @_;
    {
        my $t;
        $t .= "a"x100 for 1..$n;
        $$inside = mem();
        $$facts = { length => length($t) };
    }
}

sub run_case {
    my ($num, $scale) = @_;
    my $c = $CASES[$num];
    my $n = $c->{n} ? int($c->{n} * $scale + 0.5) : 0;
    $n = 1 if $c->{n} && $n < 1;
    (my $code = $c->{code}) =~ s/\{N\}/$n/g;
    $code =~ s/\$n\b/$n/g if $c->{plain};
    srand(20180713);
    my ($inside, $facts);
    my $before = mem();
    if ($c->{plain}) {
        plain_block($n, \$inside, \$facts);
    } else {
        # The write-up's code ran without warnings ("k".$key_id starts from undef).
        my $ok = eval 'no warnings; my ($t, @ta, %th, %th2, $key_id); ' . $code
                    . '; $inside = main::mem(); '
                    . '$facts = main::facts_of(\$t, \@ta, \%th, \%th2); 1';
        die "case $num failed: $@" unless $ok;
    }
    my $after = mem();
    print json({ case => $num, title => $c->{title}, code => $code, scale => $scale,
                 count => $n, before => $before, inside => $inside, after => $after,
                 facts => $facts, perl => sprintf('%vd', $^V), allocator => allocator() }),
          "\n";
}

sub run_probe {
    my ($len, $count, $rounds) = @_;
    my @results;   # printed at the end: nothing else runs between the rounds
    for my $round (1..$rounds) {
        my ($inside, $svlen);
        my $before = mem();
        {
            my @ta;
            push(@ta, "." x $len) for 1..$count;
            $svlen = B::svref_2object(\$ta[0])->LEN;
            $inside = mem();
        }
        my $after = mem();
        push(@results, { probe => $len + 0, count => $count + 0, round => $round,
                         svlen => $svlen, before => $before, inside => $inside,
                         after => $after });
    }
    my $alloc = allocator();
    for my $r (@results) {
        print json({ %$r, perl => sprintf('%vd', $^V), allocator => $alloc }), "\n";
    }
}

sub main {
    my @argv = @_;
    my ($case, $scale, $probe, $count, $rounds) = (undef, 1, undef, 200, 1);
    {
        local $SIG{__WARN__} = sub { usage($_[0] =~ s/\s+$//r) };
        GetOptionsFromArray(\@argv, 'case=i' => \$case, 'scale=f' => \$scale,
                            'probe=i' => \$probe, 'count=i' => \$count,
                            'rounds=i' => \$rounds) or usage();
    }
    usage("unexpected argument '$argv[0]'") if @argv;
    usage("give one of --case or --probe") unless defined($case) xor defined($probe);
    if (defined $case) {
        usage("--case must be 1..$#CASES") unless $case >= 1 && $case <= $#CASES;
        usage("--scale must be in (0, 1]") unless $scale > 0 && $scale <= 1;
        run_case($case, $scale);
    } else {
        usage("--probe must be 1..16777216") unless $probe >= 1 && $probe <= 16 * 1024 * 1024;
        usage("--count must be 1..100000") unless $count >= 1 && $count <= 100_000;
        usage("--rounds must be 1..100") unless $rounds >= 1 && $rounds <= 100;
        run_probe($probe, $count, $rounds);
    }
    return 0;
}

exit(main(@ARGV));
